"""cryobox as an MCP server (the ``mcp`` SDK): the same tools over stdio (``cryobox mcp``) and streamable HTTP
(``/mcp`` on the control plane).

- :mod:`.args`: each tool's arguments (a pydantic model: the JSON schema the client sees, and its validation);
- :mod:`.tools`: what each tool does, written once on the async SDK (:class:`cryobox.AsyncSandbox`);
- :mod:`.results`: success and error results (an error carries the API's wire body), with the key redacted;
- :mod:`.server`: the MCP server object (tool list and dispatch) over an :class:`~.tools.ApiBinding` source;
- :mod:`.stdio`: the stdio transport, a pure API client of ``$CRYOBOX_API_URL`` with ``$CRYOBOX_API_KEY``;
- :mod:`.http`: the ``/mcp`` endpoint, whose tools call the app itself in process with the caller's key.
"""
