-- Argo CD health check for inferencecache.io CacheBackend.
-- Healthy: Ready=True for the current generation.
-- Degraded: Degraded=True (the reason and message say why).
-- Progressing: anything else, including a status that describes an older
-- generation than the one just synced.
-- EnginesWired=False does not change the status (a Ready backend whose
-- engines were admitted before its endpoint stays Healthy): the message
-- says so. Engines in a later sync wave must not wait on themselves, and
-- the engine Deployment's own health shows the healing roll.
-- Multiprocess mode (spec.multiprocess: one server per node, a DaemonSet):
-- Progressing while status.multiprocess says fewer servers ready than
-- nodes selected, naming ready/desired and the first unready nodes;
-- Healthy with Ready=True when every selected node's server is ready, or
-- when no node is selected yet (a GPU pool scaled to zero grows when the
-- engines, in a later sync wave, are pending: waiting here would hold them).
local hs = {}
local function mpServers(mp)
  local msg = tostring(mp.readyServers or 0) .. " of " .. tostring(mp.desiredServers or 0) .. " node servers ready"
  local unready = {}
  if mp.nodes ~= nil then
    for _, n in ipairs(mp.nodes) do
      if n.ready ~= true and #unready < 3 then
        table.insert(unready, tostring(n.node) .. " (" .. tostring(n.pod) .. ")")
      end
    end
  end
  if #unready > 0 then
    msg = msg .. "; not ready: " .. table.concat(unready, ", ")
  end
  return msg
end
if obj.status == nil or obj.status.conditions == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to report status"
  return hs
end
if obj.metadata.generation ~= nil and obj.status.observedGeneration ~= obj.metadata.generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to observe generation " .. tostring(obj.metadata.generation)
  return hs
end
local ready = nil
local degraded = nil
local wired = nil
for _, c in ipairs(obj.status.conditions) do
  if c.type == "Ready" then
    ready = c
  elseif c.type == "Degraded" then
    degraded = c
  elseif c.type == "EnginesWired" then
    wired = c
  end
end
local mp = nil
if obj.spec ~= nil and obj.spec.multiprocess ~= nil then
  mp = obj.status.multiprocess
end
if mp ~= nil and (mp.readyServers or 0) < (mp.desiredServers or 0) and not (degraded ~= nil and degraded.status == "True") then
  hs.status = "Progressing"
  hs.message = mpServers(mp)
  if ready ~= nil and ready.status ~= "True" then
    hs.message = hs.message .. "; " .. ready.reason .. ": " .. ready.message
  end
  return hs
end
if ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  hs.message = ready.message
  if mp ~= nil then
    if (mp.desiredServers or 0) == 0 then
      -- The operator's own message says so since issue 39; older ones
      -- said "0 of 0 replicas available".
      if string.find(hs.message, "no node selected", 1, true) == nil then
        hs.message = hs.message .. "; no node selected for a server yet (spec.remoteStorage.lmCacheServer.pod): engines on a node without one cannot reach the cache"
      end
    else
      hs.message = hs.message .. "; " .. mpServers(mp)
    end
  end
  if wired ~= nil and wired.status == "False" then
    hs.message = hs.message .. "; EnginesWired=False " .. wired.reason .. ": " .. wired.message
  end
  return hs
end
if degraded ~= nil and degraded.status == "True" then
  hs.status = "Degraded"
  hs.message = degraded.reason .. ": " .. degraded.message
  return hs
end
hs.status = "Progressing"
if ready ~= nil then
  hs.message = ready.reason .. ": " .. ready.message
else
  hs.message = "Waiting for the Ready condition"
end
if mp ~= nil and (mp.desiredServers or 0) == 0 then
  hs.message = "no node selected for a server yet (spec.remoteStorage.lmCacheServer.pod); " .. hs.message
end
return hs
