# SPDX-License-Identifier: Apache-2.0
"""The exceptions solar's Python front end raises (re-exported by solar and solar.loader)."""


class SolarError(RuntimeError):
    """An error reported by libsolar (the message names what is wrong)."""


class BatchReleasedError(SolarError):
    """The batch was used after it was released (its memory now holds other samples)."""
