"""Run controls: what producers and operators do to runs besides reading them, each a
module the client (``durable.client.Client``, the one door to run state) delegates to.

- ``starts``: starting runs (``Client.start``, ``start_many``) and what a start checks;
- ``cancellation``: the cancel token tools see, the pub/sub hint, the cancel events;
- ``compensation``: a cancel that undoes the applied effects first (``Client.abort``);
- ``answers``: responses, external events and approval decisions for waiting runs;
- ``approvals`` and ``approvers``: signed approval decisions and the registry of who signs;
- ``settling``: an unknown outcome settled by a signed operator decision;
- ``quarantine``: releasing a quarantined run;
- ``children``: child runs, their parents woken and canceled with them;
- ``sessions``: named sessions, the turns of one conversation as a chain of runs;
- ``schedules``: cron schedules that start one run per slot.

The public names users need (``Cancelled``, ``CancelToken``, ``Started``) are re-exported
by ``durable``; the rest is imported from its module.
"""
