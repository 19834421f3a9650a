"""The torch workers the CLI starts in child processes (the checks, the profile's measurements, the runs), and the
ranks and libtpu helpers they use (torch). They sit above every stage they run: nothing else in meshlab imports them,
the parent starts them by module name through `meshlab.runtime.protocol`."""
