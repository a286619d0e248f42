from .cli import main

# Guarded: a check worker started with spawn imports this module as __mp_main__.
if __name__ == "__main__":
    raise SystemExit(main())
