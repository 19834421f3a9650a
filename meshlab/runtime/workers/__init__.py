"""The torch workers the CLI starts in child processes (the checks, the profile's measurements, the runs), and the
ranks and libtpu helpers they use (torch)."""
