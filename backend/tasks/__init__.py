"""Tasks: built-in data files, user task files, bring-your-own prompts, and prompt building."""
from .base import Prompt, Task, TaskError, Template
from .files import load_prompts_file, load_task_file
from .registry import builtin_tasks, load_task, task_summary

__all__ = ["Task", "Template", "Prompt", "TaskError", "load_task", "load_task_file", "load_prompts_file",
           "builtin_tasks", "task_summary"]
