"""Every attribute name we write, declared once (docs/spans-and-metrics.md says where each
goes): OpenTelemetry's semantic-convention names where they exist, ours under ``nemo.gym.*``.
Writers (advice, telemetry, setup, fastpath) and readers (``view``, ``export``, ``compare``)
import these names, and ``tests/test_architecture.py`` finds any ``nemo.gym.*`` literal left
elsewhere."""

# How a rollout ended: on its root, gym.rollout, gym.verify and the CLIENT span calling /verify
REWARD = "nemo.gym.reward"
MASK_SAMPLE = "nemo.gym.mask_sample"  # Gym 0.7+: the reward is not a valid measurement
TASK_INDEX = "nemo.gym.task.index"  # the row's _ng_task_index (the driver's POST /run, gym.rollout)
ROLLOUT_INDEX = "nemo.gym.rollout.index"  # the row's _ng_rollout_index: which repeat of the task
ROLLOUT_ID = "nemo.gym.rollout.id"  # Gym 0.5+'s rollout id (CLIENT spans, gym.rollout)
FAILURE_STAGE = "nemo.gym.failure.stage"  # a Gym 0.7 failure record's stage
# The rollout's total on its invoke_agent spans; not gen_ai.usage.*, which UIs add up over a trace
ROLLOUT_INPUT_TOKENS = "nemo.gym.rollout.usage.input_tokens"
ROLLOUT_OUTPUT_TOKENS = "nemo.gym.rollout.usage.output_tokens"
ROLLOUT_OUTCOME = "nemo.gym.rollout.outcome"  # gym.rollout.duration_ms: success, failure
VERIFY_OUTCOME = "nemo.gym.verify.outcome"  # gym.verify.duration_ms: the verifier answered or not
ERROR_TYPE = "error.type"

# The collection job, on gym.job (its id on each rollout's root too)
JOB_PREFIX = "nemo.gym.job."  # every job attribute's; the facts files keep them all
JOB_ID = "nemo.gym.job.id"
JOB_TRACE = "nemo.gym.job.trace"  # per_rollout, single, embedded
JOB_ENTRY = "nemo.gym.job.entry"  # run_from_config (Gym's driver) or run_examples (an embedder's)
JOB_ROLLOUTS_SENT = "nemo.gym.job.rollouts.sent"
JOB_ROLLOUTS_FAILED = "nemo.gym.job.rollouts.failed"
JOB_NUM_REPEATS = "nemo.gym.job.num_repeats"
JOB_ROLLOUTS_EXPECTED = "nemo.gym.job.rollouts.expected"  # the job's size, when the driver makes it known
# gym.submit (gym eval submit, Slurm)
SUBMIT_EXECUTOR = "nemo.gym.submit.executor"
SUBMIT_CLUSTER = "nemo.gym.submit.cluster"
SUBMIT_BENCHMARKS = "nemo.gym.submit.benchmarks"
SUBMIT_DRY_RUN = "nemo.gym.submit.dry_run"
SUBMIT_ID = "nemo.gym.submit.id"
SUBMIT_SLURM_JOB_IDS = "nemo.gym.submit.slurm.job_ids"
SUBMIT_FAILED = "nemo.gym.submit.failed"

# The process and its server: resource attributes, some on spans and metrics too
SERVICE_NAME = "service.name"
HOST_NAME = "host.name"
PROCESS_PID = "process.pid"
SERVER_NAME = "nemo.gym.server.name"  # the Gym server (a Ray worker: whose work it does)
SERVER_TYPE = "nemo.gym.server.type"
SERVER_WORKER = "nemo.gym.server.worker"  # gym.server.startup.worker: the uvicorn worker's pid
SERVICE_GROUP = "nemo.gym.service_group"  # the server's name without its worker suffix
PROCESS_ROLE = "nemo.gym.process.role"  # server, orchestrator, ray_worker, process
RUN_ID = "nemo.gym.run.id"
GYM_VERSION = "nemo.gym.version"
SHARD = "nemo.gym.shard"  # a Ray actor's shard, and its children's
RESOURCES_SERVER = "nemo.gym.resources_server.name"  # gym.rollout.reward: the agent's resources server
MODEL_DIALECT = "nemo.gym.model.dialect"  # model call metrics: responses, chat_completions, messages
CONCURRENCY_SITE = "nemo.gym.concurrency.site"  # gym.concurrency.*: <server class>.<attribute>
GC_GENERATION = "nemo.gym.gc.generation"
SANDBOX_PROVIDER = "nemo.gym.sandbox.provider"
SANDBOX_ID = "nemo.gym.sandbox.id"
SANDBOX_RETURN_CODE = "nemo.gym.sandbox.return_code"
SANDBOX_ERROR_TYPE = "nemo.gym.sandbox.error_type"

# HTTP: semantic conventions, and where a call goes in Gym's fleet
HTTP_REQUEST_METHOD = "http.request.method"
HTTP_ROUTE = "http.route"
HTTP_RESPONSE_STATUS_CODE = "http.response.status_code"
URL_FULL = "url.full"
URL_TEMPLATE = "url.template"
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"
DESTINATION = "nemo.gym.http.destination.server.name"  # the callee's Gym server name, else host:port
DESTINATION_ROUTE = "nemo.gym.http.destination.route"  # the route called, rollout prefix left off
QUEUE_OUTCOME = "nemo.gym.http.connection_pool.queue_outcome"
HTTP_INTERNAL = "nemo.gym.http.internal"  # retry and timeout counts: the callee is a Gym server
RETRY_REASON = "nemo.gym.http.retry_reason"

# GenAI semantic conventions
OPERATION = "gen_ai.operation.name"
AGENT_NAME = "gen_ai.agent.name"
TOOL_NAME = "gen_ai.tool.name"
REQUEST_MODEL = "gen_ai.request.model"
RESPONSE_MODEL = "gen_ai.response.model"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"

# Ray: where a Gym task ran (``advice/ray_worker.py``) and which actor a worker is (``ray_actor``)
RAY_TASK_FUNCTION = "ray.task.function"
RAY_TASK_ID = "ray.task.id"
RAY_TASK_WAIT = "ray.task.wait.duration"  # seconds between submission and the start of execution
RAY_NODE_ID = "ray.node.id"
RAY_WORKER_ID = "ray.worker.id"
RAY_ACTOR_ID = "ray.actor.id"
RAY_ACTOR_NAME = "ray.actor.name"
RAY_JOB_ID = "ray.job.id"
