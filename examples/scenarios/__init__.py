"""Seven self-checking scenarios of the example agents against real processes.

Each one is a module with ``TITLE``, ``WINDOW`` and ``run(scene, outcome)``, runnable on
its own (``python -m examples.scenarios.normal``), driven by the tests, and run all together
by ``python -m examples demo``. Each checks the applications per key in the world, the final state
and ``verify`` on the run, and fails loudly (exit status 1, or ``Outcome.assert_ok``
raising ``AssertionError``) when anything differs from what it must be.

- ``normal``: completion, nothing injected;
- ``crash``: worker SIGKILLed between an effect and its outcome;
- ``timeout``: a tool's reply never comes in time; resolved by lookup;
- ``cancel``: cancellation while a tool runs;
- ``replay``: replay after recovery rebuilds the same state, and re-driving applies nothing;
- ``approval``: the ``announce`` agent waits for an approver holding no lease and no worker;
  a wrong role is refused and writes nothing; once approved, the effect happens once;
- ``assistant``: the LLM tool-calling ``assistant`` agent (ordinary code, the world's
  scripted model) SIGKILLed while a model reply is not yet recorded; no recorded model call
  is sent again and no effect happens twice.
"""

from examples.scenarios.runner import NAMES, run_one
from examples.scenarios.stack import Scene, Stack

__all__ = ["NAMES", "Scene", "Stack", "run_one"]
