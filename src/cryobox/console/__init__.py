"""The web console's back end: cookie sessions over API keys, the static single-page app at ``/ui``, live events
(SSE), the metrics sampler, server-side bisect jobs and exec history."""
