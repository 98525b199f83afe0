{{/*
The processes' own start rules (crates/paddock/src/validate.rs, `paddock check-config`) for the
settings these values own: a configuration the pods would refuse to start with is refused here, every
problem at once, each naming its value and its variable. A test (crates/paddock/tests/chart.rs)
renders combinations of values and holds this list and the processes' to the same verdicts. What
only the processes can see (the keys in an existing Secret, values passed through `config:`) they
check at start, all at once too.
*/}}
{{- define "paddock.check" -}}
{{- $v := .Values -}}
{{- $problems := list -}}
{{- $redfish := eq $v.drivers.bmc "redfish" -}}
{{- if and (eq $v.drivers.kube "kubernetes") (not (include "paddock.stacksMounted" .)) -}}
{{- $problems = append $problems "stacks.image.reference or stacks.persistentVolumeClaim.claimName (PADDOCK_STACKS_DIR): the stacks directory, required with drivers.kube=kubernetes" -}}
{{- end -}}
{{- if $redfish -}}
{{- range $value, $name := dict "images.wipeUrl" "PADDOCK_WIPE_IMAGE_URL" "images.osUrl" "PADDOCK_OS_IMAGE_URL" "agent.baseUrl" "PADDOCK_AGENT_BASE_URL" "agent.seedBaseUrl" "PADDOCK_AGENT_SEED_BASE_URL" -}}
{{- if not (index (dict "images.wipeUrl" $v.images.wipeUrl "images.osUrl" $v.images.osUrl "agent.baseUrl" $v.agent.baseUrl "agent.seedBaseUrl" $v.agent.seedBaseUrl) $value) -}}
{{- $problems = append $problems (printf "%s (%s): required with drivers.bmc=redfish (an https URL)" $value $name) -}}
{{- end -}}
{{- end -}}
{{- else if and (ne $v.drivers.bmc "none") (not $v.agent.baseUrl) (not $v.agent.insecureHttp) -}}
{{- $problems = append $problems "agent.baseUrl (PADDOCK_AGENT_BASE_URL): required with a BMC driver, since the default is plain http (or agent.insecureHttp for a lab)" -}}
{{- end -}}
{{- range $value, $pair := dict "agent.baseUrl" (list "PADDOCK_AGENT_BASE_URL" $v.agent.baseUrl) "agent.seedBaseUrl" (list "PADDOCK_AGENT_SEED_BASE_URL" $v.agent.seedBaseUrl) "images.wipeUrl" (list "PADDOCK_WIPE_IMAGE_URL" $v.images.wipeUrl) "images.osUrl" (list "PADDOCK_OS_IMAGE_URL" $v.images.osUrl) -}}
{{- $url := index $pair 1 -}}
{{- if $url -}}
{{- $scheme := (urlParse $url).scheme -}}
{{- if not (or (eq $scheme "https") (and $v.agent.insecureHttp (eq $scheme "http"))) -}}
{{- $problems = append $problems (printf "%s (%s): must be an https URL (plain http only with agent.insecureHttp), not %q" $value (index $pair 0) $url) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- range $value, $pair := dict "images.wipeSha256" (list "PADDOCK_WIPE_IMAGE_SHA256" $v.images.wipeSha256) "images.osSha256" (list "PADDOCK_OS_IMAGE_SHA256" $v.images.osSha256) -}}
{{- $digest := index $pair 1 -}}
{{- if $digest -}}
{{- if not (regexMatch "^[0-9a-f]{64}$" $digest) -}}
{{- $problems = append $problems (printf "%s (%s): must be a SHA-256 in lower-case hex (64 digits)" $value (index $pair 0)) -}}
{{- end -}}
{{- else if $redfish -}}
{{- $problems = append $problems (printf "%s (%s): required with drivers.bmc=redfish (the image's SHA-256: `sha256sum`)" $value (index $pair 0)) -}}
{{- end -}}
{{- end -}}
{{- if eq (int $v.metrics.port) 8080 -}}
{{- $problems = append $problems "metrics.port (PADDOCK_METRICS_LISTEN): must differ from the API's port 8080" -}}
{{- end -}}
{{- if and $v.agent.service.enabled (has (int $v.agent.listenPort) (list 8080 (int $v.metrics.port))) -}}
{{- $problems = append $problems "agent.listenPort (PADDOCK_AGENT_LISTEN): must differ from the API's port 8080 and metrics.port (a listener of its own)" -}}
{{- end -}}
{{- if not (or $v.secrets.existingSecret $v.secrets.generateHs256Secret $v.jwt.jwksUrl $v.jwt.publicKeysSecret) -}}
{{- $problems = append $problems "jwt.jwksUrl, jwt.publicKeysSecret or secrets.generateHs256Secret (PADDOCK_JWT_HS256_SECRET, PADDOCK_JWT_PUBLIC_KEYS, PADDOCK_JWT_JWKS_URL): the API needs a token key" -}}
{{- end -}}
{{- $oidc := $v.console.oidc -}}
{{- if or $oidc.discoveryUrl $oidc.clientId $oidc.redirectUri -}}
{{- if not (and $oidc.discoveryUrl $oidc.clientId $oidc.redirectUri) -}}
{{- $problems = append $problems "console.oidc.discoveryUrl, console.oidc.clientId and console.oidc.redirectUri (PADDOCK_CONSOLE_OIDC_DISCOVERY_URL, PADDOCK_CONSOLE_OIDC_CLIENT_ID, PADDOCK_CONSOLE_OIDC_REDIRECT_URI): set together or not at all" -}}
{{- end -}}
{{- range $value, $pair := dict "console.oidc.discoveryUrl" (list "PADDOCK_CONSOLE_OIDC_DISCOVERY_URL" $oidc.discoveryUrl) "console.oidc.redirectUri" (list "PADDOCK_CONSOLE_OIDC_REDIRECT_URI" $oidc.redirectUri) -}}
{{- $url := index $pair 1 -}}
{{- if $url -}}
{{- $parsed := urlParse $url -}}
{{- $loopback := has $parsed.hostname (list "127.0.0.1" "localhost" "::1") -}}
{{- if not (or (eq $parsed.scheme "https") (and $loopback (eq $parsed.scheme "http"))) -}}
{{- $problems = append $problems (printf "%s (%s): must be an https URL, not %q" $value (index $pair 0) $url) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if and $oidc.redirectUri (not (hasSuffix "/console/" (urlParse $oidc.redirectUri).path)) -}}
{{- $problems = append $problems "console.oidc.redirectUri (PADDOCK_CONSOLE_OIDC_REDIRECT_URI): must be the console's URL, ending in /console/" -}}
{{- end -}}
{{- if and $oidc.discoveryUrl (ne (trimSuffix "/" (trimSuffix "/.well-known/openid-configuration" $oidc.discoveryUrl)) (trimSuffix "/" $v.jwt.issuer)) -}}
{{- $problems = append $problems "console.oidc.discoveryUrl (PADDOCK_CONSOLE_OIDC_DISCOVERY_URL): must be the discovery document of jwt.issuer (PADDOCK_JWT_ISSUER), <issuer>/.well-known/openid-configuration" -}}
{{- end -}}
{{- if not (or $v.jwt.jwksUrl $v.jwt.publicKeysSecret) -}}
{{- $problems = append $problems "jwt.jwksUrl or jwt.publicKeysSecret (PADDOCK_JWT_JWKS_URL, PADDOCK_JWT_PUBLIC_KEYS): sign-in through the OIDC issuer (console.oidc) needs the issuer's keys" -}}
{{- end -}}
{{- end -}}
{{- with $v.slurm.imageRegistry -}}
{{- if not (and (le (len .) 200) (regexMatch "^[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?(\\.[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?)*(:[0-9]{1,5})?(/[a-z0-9]+(([._]|__|-+)[a-z0-9]+)*)*$" .)) -}}
{{- $problems = append $problems (printf "slurm.imageRegistry (PADDOCK_SLURM_IMAGE_REGISTRY): %q is not an image registry: a host, an optional port and path (lowercase), no scheme, tag or trailing '/'" .) -}}
{{- end -}}
{{- end -}}
{{- if not (has $v.database.sslMode (list "verify-full" "verify-ca" "require" "prefer" "allow" "disable")) -}}
{{- $problems = append $problems "database.sslMode (PGSSLMODE): must be one of verify-full, verify-ca, require, prefer, allow, disable" -}}
{{- end -}}
{{- with $problems -}}
{{- fail (printf "the values have %d problem(s) the processes would refuse to start with:\n  - %s" (len .) (join "\n  - " .)) -}}
{{- end -}}
{{- end -}}
