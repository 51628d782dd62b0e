"""The loopback daemon under a real adb server: the ADB transport, shell (v1, v2) and sync services."""

import os

import adbutils
import pytest


def test_shell_v2_exit_codes_stderr_and_v1_output(phone, adb_server):
    d = adbutils.AdbClient(port=adb_server).device(phone.serial)
    r = d.shell2("echo out; echo err >&2; exit 7", v2=True)
    assert (r.returncode, r.stdout, r.stderr) == (7, "out\n", "err\n")
    assert d.shell("getprop ro.product.model") == "LETI Loopback"
    big = d.shell("head -c 600000 /dev/zero | tr '\\0' 'x'")  # more than one max-size WRTE
    assert len(big) == 600000
    assert "shell_v2" in d.get_features()


def test_sync_push_stat_list_pull(phone, adb_server, tmp_path):
    d = adbutils.AdbClient(port=adb_server).device(phone.serial)
    data = os.urandom(700_000)
    d.sync.push(data, "/data/local/tmp/blob.bin", 0o640)
    assert (phone.sandbox / "data/local/tmp/blob.bin").read_bytes() == data  # it landed in the sandbox
    st = d.sync.stat("/data/local/tmp/blob.bin")
    assert st.size == 700_000 and st.mode & 0o777 == 0o640
    assert d.sync.stat("/data/local/tmp/missing").mtime is None
    assert "blob.bin" in [f.path for f in d.sync.list("/data/local/tmp")]
    assert d.sync.read_bytes("/data/local/tmp/blob.bin") == data
    with pytest.raises(adbutils.AdbError, match="does not exist"):
        d.sync.read_bytes("/data/local/tmp/missing")
    assert d.shell("cat /data/local/tmp/blob.bin | wc -c").strip() == "700000"  # shell sees the same paths


def test_closing_a_stream_stops_the_command(phone, adb_server):
    d = adbutils.AdbClient(port=adb_server).device(phone.serial)
    with pytest.raises(adbutils.AdbTimeout):
        d.shell2("sleep 30; echo never", timeout=1, v2=True)
    import time

    for _ in range(50):
        if "sleep 30" not in d.shell("ps -eo args | grep 'sleep 3[0]'; true"):
            break
        time.sleep(0.1)
    else:
        pytest.fail("the command kept running after its stream was closed")
