"""schemathesis hooks of scripts/fuzz (loaded through the `hooks` setting of its config files).

- An `Idempotency-Key` that paddock accepts (1 to 255 visible ASCII characters) is made unique per
  request: the generator repeats small values, and a key sent again with another body is a
  documented 422 (idempotency_key_reused), so nearly every create would be refused and no created
  id would flow into the next calls. A key paddock refuses is sent as generated.
"""

import re
import uuid

import schemathesis

ACCEPTED_KEY = re.compile(r"[\x21-\x7e]{1,255}")


@schemathesis.hook
def before_call(ctx, case, **kwargs):
    key = (case.headers or {}).get("Idempotency-Key")
    if isinstance(key, str) and ACCEPTED_KEY.fullmatch(key):
        case.headers["Idempotency-Key"] = f"fuzz-{uuid.uuid4()}"
