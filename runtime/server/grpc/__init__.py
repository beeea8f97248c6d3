"""The gRPC worker front of ``kvreuse serve`` (``--grpc-port``): SMG's engine service and KV event stream."""
