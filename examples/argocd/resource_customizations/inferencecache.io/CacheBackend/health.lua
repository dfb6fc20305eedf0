-- Argo CD health check for inferencecache.io CacheBackend.
-- Healthy: Ready=True for the current generation.
-- Degraded: Degraded=True (the reason and message say why).
-- Progressing: anything else, including a status that describes an older
-- generation than the one just synced.
-- EnginesWired=False does not change the status (a Ready backend whose
-- engines were admitted before its endpoint stays Healthy): the message
-- says so. Engines in a later sync wave must not wait on themselves, and
-- the engine Deployment's own health shows the healing roll.
local hs = {}
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
if ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  hs.message = ready.message
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
return hs
