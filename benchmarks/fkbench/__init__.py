"""The dispatch benchmark's harness (``python benchmarks/dispatch.py``); not part of the wheel.

- :mod:`fkbench.kernels`: the benchmark kernels and call shapes;
- :mod:`fkbench.common`: timing loops, the systems timed alike everywhere, the report;
- :mod:`fkbench.gpu`: every system on a GPU;
- :mod:`fkbench.host`: fastkernel's own host cost against the recording stand-in driver;
- :mod:`fkbench.callgrind`: instructions per hit under valgrind;
- :mod:`fkbench.warm`: first launch in a fresh process with a warm disk cache.
"""
