"""hypercorn settings of the API: `python -m app api` loads them, and so can hypercorn's own CLI:

    hypercorn --config python:app.hypercorn_config app.asgi:app --bind 0.0.0.0:8000

A request head (URL and headers) over hypercorn's limit is answered by hypercorn itself, before the
app is called: a 431 (400 for a malformed head) with an empty body that the app cannot shape. The app
refuses heads over app.api.request.MAX_REQUEST_HEAD_BYTES (8 KiB) with a JSON 431, so hypercorn's
limit is set well above it: only a head over 64 KiB still gets hypercorn's empty answer.

Only hypercorn setting names belong in this module (hypercorn reads every public name).
"""

import logging

import agent_async.logs

# Bytes h11 buffers for one request head (hypercorn's default: 16 KiB).
h11_max_incomplete_size = 64 * 1024

# Logging in AGENT_LOG_FORMAT (docs/logging.md), applied by hypercorn in every process it runs,
# spawned workers included; its error log goes through that root handler instead of a second
# handler of its own (which would print each line twice, in another format).
logconfig_dict = agent_async.logs.DICT_CONFIG_FROM_ENV
errorlog = logging.getLogger("hypercorn.error")
