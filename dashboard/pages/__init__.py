"""The three pages: run list, one run, two runs compared. Each module owns its layout() and register()."""
