"""The host agent behind the typed interface (:class:`cryobox.agentapi.Agent`): every operation a control plane
calls."""
