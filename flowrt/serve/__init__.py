"""``flowrt serve``: a model repository served over HTTP with the KServe v2 protocol (see
``flowrt.serve.server``; its HTTP application: ``http``; the repository and queues:
``models``; ensembles: ``ensemble``; the configuration: ``config``; the wire format:
``protocol``)."""
