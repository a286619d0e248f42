"""A module whose import starts a thread (the compile-zygote preload test: a zygote must not fork
after importing it)."""

import threading
import time

threading.Thread(target=time.sleep, args=(3600,), name="preload-stray", daemon=True).start()
