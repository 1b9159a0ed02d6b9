-- Argo CD health of an RLTrainingJob (rljob.dev), read from the conditions the rljob operator writes.
-- Argo runs argocd-cm scripts without Lua's string library, so messages are built with `..` only.
-- A running job is Healthy: training takes days, and Progressing would hold the Application (and
-- `argocd app wait --health`) until it ends. Status and phases: docs/gitops.md.
local hs = {}

local function condition(kind)
  if obj.status.conditions == nil then
    return nil
  end
  for _, c in ipairs(obj.status.conditions) do
    if c.type == kind then
      return c
    end
  end
  return nil
end

local function isTrue(kind)
  local c = condition(kind)
  return c ~= nil and c.status == "True"
end

local function messageOf(kind)
  local c = condition(kind)
  if c == nil or c.message == nil then
    return ""
  end
  return c.message
end

-- "<phase>: <message>": Progressing alone does not say whether the job waits for GPUs or starts.
local function withPhase(message)
  if message == "" then
    return obj.status.phase
  end
  return obj.status.phase .. ": " .. message
end

if obj.status == nil or obj.status.phase == nil then
  hs.status = "Progressing"
  hs.message = "waiting for the rljob operator to pick the job up (no status yet; is the operator running?)"
  return hs
end

-- A status computed from an older spec says nothing about the current one (kstatus does the same).
local generation = obj.metadata.generation
local observed = obj.status.observedGeneration
if generation ~= nil and observed ~= generation then
  hs.status = "Progressing"
  hs.message = "waiting for the operator to observe generation " .. generation
  if observed ~= nil then
    hs.message = hs.message .. " (status is from generation " .. observed .. ")"
  end
  return hs
end

if isTrue("Failed") then
  hs.status = "Degraded"
  hs.message = messageOf("Failed")
elseif isTrue("Stalled") then
  -- Not failed but cannot go on until someone acts, e.g. a missing Secret or PVC.
  hs.status = "Degraded"
  hs.message = messageOf("Stalled")
elseif isTrue("Succeeded") then
  hs.status = "Healthy"
  hs.message = messageOf("Succeeded")
elseif isTrue("Suspended") then
  hs.status = "Suspended"
  hs.message = messageOf("Suspended")
elseif obj.status.phase == "Running" and isTrue("Ready") then
  hs.status = "Healthy"
  hs.message = withPhase(messageOf("Ready"))
elseif isTrue("Queued") then
  hs.status = "Progressing"
  hs.message = withPhase(messageOf("Queued"))
elseif isTrue("Reconciling") then
  hs.status = "Progressing"
  hs.message = withPhase(messageOf("Reconciling"))
else
  -- Any other phase (one a later version adds) is on its way somewhere.
  hs.status = "Progressing"
  hs.message = withPhase(messageOf("Ready"))
end
return hs
