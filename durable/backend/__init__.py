"""Redis plumbing: reaching the server and living with it going away.

- ``connection``: connecting to the embedded server or ``DURABLE_REDIS_URL``, checked for
  safety;
- ``embedded``: the embedded ``redis-server`` run under the data directory;
- ``cluster``: a local Redis Cluster on loopback, for development and tests;
- ``subscriber``: a cancel-channel subscription that outlives Redis faults;
- ``outages``: waiting, retrying and reporting while Redis is away.
"""
