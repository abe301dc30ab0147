"""Generated protobuf and gRPC code for lenserve's service contract (see protos/).

Made by ``python scripts/gen_protos.py``; do not edit the ``*_pb2*`` files by hand.
"""
