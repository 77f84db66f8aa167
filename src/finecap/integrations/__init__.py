"""Adapters from finecap to other tools' interfaces: :mod:`finecap.integrations.trl` (finecap's rewards as TRL reward
functions). Each adapter imports only finecap and the standard library at import time; the other tool is needed only
by the code that runs it."""
