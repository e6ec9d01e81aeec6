"""The HTTP front of one node, on its ``admin_address`` (docs/operations.md,
docs/http-api.md):

* ``admin``: ``AdminEndpoint``, the aiohttp server: ``/metrics``, ``/livez``,
  ``/readyz``, ``/status``, and the mounts below;
* ``http_api``: ``HttpApi``, the ``/v1/`` HTTP/JSON resources and ``/openapi.json``;
* ``openapi``: the routes, their field table, the OpenAPI document, the
  code-to-status table;
* ``http_forward``: ``Forwarder``, a follower's client connections to the leader;
* ``dashboard``: the live view at ``/ui/`` (its page, script and style in ``ui/``,
  package data);
* ``node_api``: ``NodeApi``, the small interface of the node this package is typed
  against. Nothing here imports ``server.node``: the node imports this package.
"""
