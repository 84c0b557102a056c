"""``flowrt serve``: a model repository served over HTTP with the KServe v2 protocol (see
``flowrt.serve.server``; the repository and queues: ``models``; the configuration:
``config``; the wire format: ``protocol``)."""
