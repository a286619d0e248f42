"""A module whose import ends the importing process with exit code 7 (the compile-zygote preload
tests: a trial that dies in an import). Only a zygote imports it, never a test process."""

import os

os._exit(7)
