"""The task pipeline: one Hub task from validation to the report, one module per stage.

    _runtime   TaskRuntime: what a task needs from its process (settings, Redis, agents,
               model and toolbox makers), built from the environment and rq's job
    _run       TaskRun: parse → agent → leases → deadline → tools → budget → request → execute
               → respond → remember → settle, and ``execute_task``
    _context   the ExecutionRequest: thread or feed, system prompt, loop settings, grants
    _prompt    the text of the system prompt and the first message (thread or feed)
    _early_tools  the task's toolbox, opened while the Hub is read
    _respond   the answer on the Hub
    _memory    the agent's memory: recalled into the first message, written after the answer
    _settle    the report, read mark, consumption, activation, error post, metrics, logs
    _writes    Hub writes through the outbox, counted against the write caps
    _observers the metrics observer of the loop
    _state     RunState, the Requeue decision and the TaskVerdict

``worker.jobs.run_task`` is the rq entry point that drives it.
"""

from worker.pipeline._observers import metrics_observer as metrics_observer
from worker.pipeline._run import execute_task as execute_task
from worker.pipeline._runtime import TaskRuntime as TaskRuntime
from worker.pipeline._runtime import make_model as make_model
from worker.pipeline._runtime import preload as preload
from worker.pipeline._runtime import runtime_for_job as runtime_for_job
from worker.pipeline._settle import error_post_content as error_post_content
from worker.pipeline._state import TaskVerdict as TaskVerdict
