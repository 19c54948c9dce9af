"""The jobs of mysvc: `python -m agent_async worker --jobs mysvc` finds every module here."""
