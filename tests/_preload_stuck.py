"""A module whose import never ends (the compile-zygote preload tests: a trial stuck in it ends with
the zygote). It appends the importing process's pid to ``KERNELGRAFT_TEST_PRELOAD_LOG`` first.
Only a zygote imports it, never a test process."""

import os
import time

_log = os.environ.get("KERNELGRAFT_TEST_PRELOAD_LOG")
if _log:
    with open(_log, "a") as f:
        f.write(f"{os.getpid()}\n")
time.sleep(3600)
