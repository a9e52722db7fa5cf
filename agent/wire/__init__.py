"""The agent's API on the wire: protobuf messages <-> domain records, one module per service
area, and the domain-error <-> gRPC status mapping (errors.py).

Pure functions, no I/O and no calls: the servicers (agent/api) parse requests and answer with
them, the clients (agent/client) turn answers back into records, so the CLI and the
coordinator see the same records the agent's services make, and nothing above agent/client
touches a generated message.
"""
