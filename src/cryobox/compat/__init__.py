"""The front doors of other sandbox services (E2B, PandaStack): adapters from their wire contracts onto the control
plane."""
