"""schemathesis hooks of scripts/fuzz (loaded through the `hooks` setting of its config files).

- A YAML answer whose schema is `type: string` (the kubeconfig: the file a client saves) is
  checked as the text it is; schemathesis would parse it and find an object, not a string. A YAML
  answer with any other schema is parsed as schemathesis does.
- An `Idempotency-Key` that paddock accepts (1 to 255 visible ASCII characters) is made unique per
  request: the generator repeats small values, and a key sent again with another body is a
  documented 422 (idempotency_key_reused), so nearly every create would be refused and no created
  id would flow into the next calls. A key paddock refuses is sent as generated.
"""

import re
import uuid

import schemathesis
from schemathesis.core.deserialization import deserialize_yaml
from schemathesis.core.media_types import YAML_MEDIA_TYPES

ACCEPTED_KEY = re.compile(r"[\x21-\x7e]{1,255}")


# Every YAML media type: schemathesis uses the first registered one of the answer's family.
@schemathesis.deserializer(*YAML_MEDIA_TYPES)
def yaml_text_or_data(ctx, response):
    responses = ctx.operation.definition.raw.get("responses", {})
    documented = responses.get(str(response.status_code), responses.get("default", {}))
    content = documented.get("content", {})
    schemas = [content[media]["schema"] for media in YAML_MEDIA_TYPES if "schema" in content.get(media, {})]
    text = response.content.decode(response.encoding or "utf-8")
    return text if schemas and schemas[0].get("type") == "string" else deserialize_yaml(text)


@schemathesis.hook
def before_call(ctx, case, **kwargs):
    key = (case.headers or {}).get("Idempotency-Key")
    if isinstance(key, str) and ACCEPTED_KEY.fullmatch(key):
        case.headers["Idempotency-Key"] = f"fuzz-{uuid.uuid4()}"
