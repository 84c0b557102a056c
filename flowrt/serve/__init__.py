"""``flowrt serve``: a model repository served over HTTP and gRPC with the KServe v2 protocol
(see ``flowrt.serve.server``; its HTTP application: ``http``; its gRPC service: ``grpc_service``; the repository and queues:
``models``; ensembles: ``ensemble``; the configuration: ``config``; the wire format:
``protocol``)."""
