# kernels unit tests
