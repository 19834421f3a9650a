"""The torch workers the CLI starts in child processes (check, profile, run), and the ranks and libtpu helpers they use."""
