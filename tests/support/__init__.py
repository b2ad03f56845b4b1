"""What the tests share, and the only test code a test module imports (fixtures come from ``conftest.py`` files or
are bound from here into the module that uses them): fakes (``FakeClock``, ``FakeAgent``), registries and a
throwaway PostgreSQL, a control plane assembled by the same composition code as the CLI, in-process apps and
servers, and the harnesses of ``cryobox serve``/``cryobox agent`` processes the integration and chaos suites use.
"""
