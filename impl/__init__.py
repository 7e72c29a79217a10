"""GPU implementations (``impl.triton``, ``impl.cutedsl``), their shared torch front end and PTX checks.

Compiles and dispatch decisions are reported on the ``dsv4_compressor`` logger, silent
unless the application configures it (a ``NullHandler`` is installed here).
"""

import logging

logging.getLogger("dsv4_compressor").addHandler(logging.NullHandler())
