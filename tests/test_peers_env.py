"""Where kvpress is missing (kvlab's main environment), the peer check says how to get it."""
import importlib.util

import pytest

from kvlab.eval import peers


@pytest.mark.skipif(importlib.util.find_spec("kvpress") is not None, reason="kvpress is installed here")
def test_missing_kvpress_says_how_to_install_it():
    with pytest.raises(ImportError, match=r"constraints-peers\.txt"):
        peers.require_kvpress()
