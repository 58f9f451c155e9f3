# common unit tests
