# rpc unit tests
