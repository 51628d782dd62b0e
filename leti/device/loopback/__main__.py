"""``python -m leti.device.loopback --port 6101 --sandbox /tmp/phone``: run a loopback device until Ctrl-C.

Attach it with ``adb connect 127.0.0.1:6101``; write the matching benchmark binary with ``--runner PATH``.
"""

import argparse
import threading

from leti.device.loopback import LoopbackDevice, write_runner_script


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, default=6101, help="TCP port (keep it outside 5555-5585)")
    ap.add_argument("--sandbox", required=True, help="folder that holds the device's files")
    ap.add_argument("--runner", help="also write the benchmark_model stand-in to this path")
    args = ap.parse_args()
    dev = LoopbackDevice(args.sandbox, args.port).start()
    if args.runner:
        write_runner_script(args.runner)
        print(f"benchmark binary: {args.runner}")
    print(f"loopback device listening on {dev.serial}; attach with: adb connect {dev.serial}", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        dev.kill()


if __name__ == "__main__":
    main()
