"""Reward functions over `crucible serve` for other trainers (docs/service.md)."""
import hashlib

from .client import ServiceError, extract_code

# Every status a sample can get (docs/evaluator.md, Statuses): a verdict's, or format_error for a
# completion with no code.
STATUSES = ("ok", "incorrect", "compile_error", "runtime_error", "timeout", "rejected", "format_error")


def _request_id(prefix, task, code):
    return prefix + hashlib.sha256((task + "\0" + code).encode("utf-8")).hexdigest()[:32]


def trl_reward(client, task_column="task", task_source_column=None, format_error_reward=0.0, id_prefix="trl-"):
    """A reward function for TRL's GRPOTrainer (`reward_funcs=[trl_reward(client)]`): for each
    completion, the candidate's code is taken out of it (extract_code) and judged on the task
    named in the dataset's `task_column` (or whose source is in `task_source_column`); the reward
    is the verdict's `reward`. A completion with no code gets `format_error_reward`. The whole
    batch goes to the service at once, so it is judged on every device it has. Each request's id is
    a digest of task and code: a sample sent twice (a retry, the same completion again) is judged
    once.

    Where TRL passes `log_extra` and `log_metric` to reward functions (GRPOTrainer and RLOOTrainer
    of recent 1.x releases; tested with trl 1.16.0), it also logs each sample's status as the
    column `crucible_status` of the completions table (`log_completions`) and the fraction of the
    batch with each status as the metrics `crucible/<status>` (all of STATUSES every batch, so
    that averages over logging steps stay fractions)."""

    def reward(prompts=None, completions=None, **kwargs):
        tasks = kwargs.get(task_source_column or task_column)
        if tasks is None:
            raise ValueError(f"the dataset has no column '{task_source_column or task_column}' naming each sample's task")
        requests, slots = [], []
        out = [format_error_reward] * len(completions)
        statuses = ["format_error"] * len(completions)
        for i, (completion, task) in enumerate(zip(completions, tasks)):
            code = extract_code(completion)
            if code is None:
                continue
            req = {"candidate": code, "id": _request_id(id_prefix, task, code)}
            req["task_source" if task_source_column else "task"] = task
            requests.append(req)
            slots.append(i)
        if requests:
            for i, verdict in zip(slots, client.evaluate_batch(requests)):
                if "error" in verdict:
                    raise ServiceError(0, f"sample {i}: {verdict['error']}")
                out[i] = float(verdict["reward"])
                statuses[i] = verdict["status"]
        log_extra, log_metric = kwargs.get("log_extra"), kwargs.get("log_metric")
        if callable(log_extra):
            log_extra("crucible_status", statuses)
        if callable(log_metric) and statuses:
            for status in STATUSES:
                log_metric("crucible/" + status, statuses.count(status) / len(statuses))
        return out

    reward.__name__ = "crucible_reward"
    return reward


def verl_compute_score(client, format_error_reward=0.0):
    """A `compute_score` for verl's custom reward function (custom_reward_function.path and
    .name in verl's config): verl calls it per sample with (data_source, solution_str,
    ground_truth, extra_info); `ground_truth` names the registered task."""

    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        code = extract_code(solution_str)
        if code is None:
            return format_error_reward
        verdict = client.evaluate(candidate=code, task=ground_truth, id=_request_id("verl-", ground_truth, code))
        return float(verdict["reward"])

    return compute_score
