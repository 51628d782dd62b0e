"""leti.engine: LETI's own inference engine (MNN-style pre-inference / execution split).

``Session(model).resize()`` plans once, ``Session.run()`` executes; models are ``.leti`` files
(:mod:`leti.engine.format`, schema in ``FORMAT.md``) written by
:func:`leti.engine.convert.from_cell.write_leti` or converted from ``.tflite``.
"""
