-- wrk script for bench/api-load: POST /v1/tenants with a new DNS-1123 name on every request.
--
--   wrk ... -H "Authorization: Bearer $token" -H "Content-Type: application/json" \
--       -s bench/wrk/post-tenants.lua http://127.0.0.1:$port/v1/tenants -- <prefix>
--
-- Names are <prefix><thread>-<counter> (e.g. "bm1-4711"): unique within one wrk run, and across
-- the runs of one benchmark as long as each run gets its own prefix (warm-up "bw", measured "bm").
-- Every answer must be 201. The `response` hook counts the others; `done` prints one line
--   post-tenants: responses=N non201=M first_bad=<status> <body...>
-- that bench/api-load checks: a run with any non-201 (or socket error) is invalid.

local threads = {}

-- Runs in the main Lua state, once per thread, before the run.
function setup(thread)
   table.insert(threads, thread)
   thread:set("thread_no", #threads)
end

-- Runs in each thread's own Lua state. Globals below are per thread; `done` reads them back.
function init(args)
   prefix = args[1] or "b"
   counter = 0
   responses = 0
   non201 = 0
   first_bad = ""
end

function request()
   counter = counter + 1
   local name = string.format("%s%d-%d", prefix, thread_no, counter)
   local body = string.format('{"name":"%s","display_name":"Bench tenant %s","labels":{"bench":"wrk"}}', name, name)
   -- nil headers = wrk.headers, which holds the -H headers (Authorization, Content-Type).
   return wrk.format("POST", nil, nil, body)
end

function response(status, headers, body)
   responses = responses + 1
   if status ~= 201 then
      non201 = non201 + 1
      if first_bad == "" then
         first_bad = tostring(status) .. " " .. string.sub(tostring(body or ""), 1, 300):gsub("%s+", " ")
      end
   end
end

-- Runs in the main Lua state after the run.
function done(summary, latency, requests)
   local total_responses, total_non201, bad = 0, 0, ""
   for _, thread in ipairs(threads) do
      total_responses = total_responses + (thread:get("responses") or 0)
      total_non201 = total_non201 + (thread:get("non201") or 0)
      local b = thread:get("first_bad") or ""
      if bad == "" and b ~= "" then bad = b end
   end
   io.write(string.format("post-tenants: responses=%d non201=%d first_bad=%s\n",
      total_responses, total_non201, bad == "" and "-" or bad))
end
