"""skyrl-gym envs written for the tests (registered on import, as a user's env module does):
``--env skyrl:eco_skyrl_toys:omnigym_calc`` and a broken one."""

import re

import skyrl_gym
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput
from skyrl_gym.tools.core import ToolGroup, tool


class CalcTools(ToolGroup):
    def __init__(self):
        super().__init__(name="CalcTools")

    @tool
    def add(self, a: str, b: str) -> str:
        return str(int(a) + int(b))


class CalcEnv(BaseTextEnv):
    """The model adds with a tool (<add>3 4</add>, answered as a user message), then answers
    (<answer>7</answer>: reward 1 if right). Each tool call is also worth 0.1 as a step reward."""

    def __init__(self, env_config=None, extras={}):
        super().__init__()
        self.answer = str(extras["reward_spec"]["ground_truth"])
        self.max_turns = int(extras.get("max_turns", 3))
        self.init_tool_groups([CalcTools()])

    def step(self, action: str) -> BaseTextEnvStepOutput:
        self.turns += 1
        answer = re.search(r"<answer>(.*?)</answer>", action)
        if answer or self.turns >= self.max_turns:
            reward = 1.0 if answer and answer.group(1).strip() == self.answer else 0.0
            return BaseTextEnvStepOutput(observations=[], reward=reward, done=True, metadata={})
        call = re.search(r"<add>(-?\d+) (-?\d+)</add>", action)
        if call is None:
            return BaseTextEnvStepOutput(observations=[{"role": "user", "content": "use <add>A B</add>"}],
                                         reward=0.0, done=False, metadata={})
        result = self._execute_tool("CalcTools", "add", call.groups())
        return BaseTextEnvStepOutput(observations=[{"role": "user", "content": f"<result>{result}</result>"}],
                                     reward=0.1, done=False, metadata={"tool": "add"})


class BrokenEnv(BaseTextEnv):
    """Broken on purpose, as env_config.how says: "string" (its observation is a bare string, not
    a list of messages), "raise" (step raises), "reward" (its reward is not a number), "huge" (1e300: finite here, inf as float32)."""

    def __init__(self, env_config=None, extras={}):
        super().__init__()
        self.how = (env_config or {}).get("how", "string")

    def step(self, action: str):
        if self.how == "raise":
            return {}["no such field"]
        if self.how == "reward":
            return BaseTextEnvStepOutput(observations=[], reward="1.0", done=True, metadata={})
        if self.how == "huge":
            return BaseTextEnvStepOutput(observations=[], reward=1e300, done=True, metadata={})
        return BaseTextEnvStepOutput(observations="the tool said 7", reward=0.0, done=False, metadata={})


for name, cls in (("omnigym_calc", CalcEnv), ("omnigym_broken", BrokenEnv)):
    if name not in skyrl_gym.registry:
        skyrl_gym.register(id=name, entry_point=cls)
