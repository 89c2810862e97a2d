"""completion: the shell completion of ``jobfence`` for bash, zsh or fish, printed for the
shell to load:

    source <(jobfence completion bash)                 # ~/.bashrc
    source <(jobfence completion zsh)                  # ~/.zshrc (after compinit)
    jobfence completion fish > ~/.config/fish/completions/jobfence.fish

Commands, their subcommands and flags, and the values a flag takes from a fixed set
(statuses, output formats). Nothing is read from the database: completing never connects.
A test keeps the table here equal to what each command's ``--help`` says.
"""

from __future__ import annotations

import sys

from jobfence import cli
from jobfence.commands import COMMANDS

BATCH = "--batch-size"
FLAGS: dict[str, str] = {
    "enqueue": "--after --delay --expires-in --idempotency-key --inactivity-timeout --inputs "
               "--group --label --max-attempts --priority --queue --resource --run-at --spec "
               "--timeout --ttl",
    "worker": "--concurrency --idle-seconds --max-jobs --max-seconds --queue",
    "sweeper": BATCH, "reconciliation": BATCH, "orphan-cleanup": BATCH, "lifecycle": BATCH,
    "export-finalize": BATCH, "schedules": BATCH,
    "migrate": "--roles-sql",
    "status": "--events --output --reason --reveal-env",
    "list": "--after --label --limit --output --parent --queue --resource --status",
    "wait": "--interval --timeout",
    "cancel": "--after --before --dry-run --label --limit --output --parent --queue "
              "--reason --resource --status --yes",
    "retry": "--after --before --dry-run --label --limit --output --parent --queue "
             "--reason --resource --status --yes",
    "drain": "--reason",
    "command-runner": "--scratch --socket",
    "metrics": "--host --port --serve",
    "logs": "--action --attempt --follow --stream",
    "runs": "--function --interval --limit --output --status --timeout --wait",
    "serve": "--host --port",
}
"""Each command's flags (besides ``--help``)."""

SUBCOMMANDS: dict[str, str] = {
    "queue": "status pause resume limit rate fair groups",
    "workflow": "status list cancel retry",
    "drain": "on off status",
    "schedule": "add list show pause resume delete",
    "pools": "render",
    "completion": "bash zsh fish",
}
VALUES: dict[str, str] = {
    "--status": "waiting pending running succeeded failed cancelled",
    "--output": "text json",
    "--function": "sweeper reconciliation lifecycle export-finalize orphan-cleanup schedules",
}


def bash() -> str:
    cases = "\n".join(
        f"        {name}) opts=\"{SUBCOMMANDS.get(name, '')} {FLAGS.get(name, '')} --help\";;"
        for name in COMMANDS)
    values = "\n".join(f"        {flag}) COMPREPLY=($(compgen -W \"{words}\" -- \"$cur\")); "
                       "return;;" for flag, words in VALUES.items())
    return f"""# bash completion for jobfence (jobfence completion bash)
_jobfence() {{
    local cur prev opts
    cur="${{COMP_WORDS[COMP_CWORD]}}"
    prev="${{COMP_WORDS[COMP_CWORD-1]}}"
    if [ "$COMP_CWORD" -eq 1 ]; then
        COMPREPLY=($(compgen -W "{' '.join(COMMANDS)} --help --version" -- "$cur"))
        return
    fi
    case "$prev" in
{values}
        -o) COMPREPLY=($(compgen -W "text json" -- "$cur")); return;;
        --spec) COMPREPLY=($(compgen -f -- "$cur")); return;;
    esac
    case "${{COMP_WORDS[1]}}" in
{cases}
        *) opts="--help";;
    esac
    COMPREPLY=($(compgen -W "$opts" -- "$cur"))
}}
complete -o default -F _jobfence jobfence
"""


def zsh() -> str:
    return "# zsh completion for jobfence (jobfence completion zsh)\n" \
           "autoload -U +X bashcompinit && bashcompinit\n" + bash()


def fish() -> str:
    lines = ["# fish completion for jobfence (jobfence completion fish)",
             "complete -c jobfence -f"]
    for name, (_, help_text) in COMMANDS.items():
        desc = help_text.replace("'", "\\'")
        lines.append(f"complete -c jobfence -n __fish_use_subcommand -a {name} "
                     f"-d '{desc}'")
        for sub in SUBCOMMANDS.get(name, "").split():
            lines.append(f"complete -c jobfence -n '__fish_seen_subcommand_from {name}' "
                         f"-a {sub}")
        for flag in FLAGS.get(name, "").split():
            values = VALUES.get(flag)
            extra = f" -xa '{values}'" if values else ""
            if flag == "--spec":
                extra = " -rF"
            lines.append(f"complete -c jobfence -n '__fish_seen_subcommand_from {name}' "
                         f"-l {flag[2:]}{extra}")
    return "\n".join(lines) + "\n"


SHELLS = {"bash": bash, "zsh": zsh, "fish": fish}


def main(argv: list[str] | None = None) -> int:
    def body() -> int:
        p = cli.Parser(prog="jobfence completion", description=__doc__)
        p.add_argument("shell", choices=sorted(SHELLS))
        args = p.parse_args(list(sys.argv[1:] if argv is None else argv))
        sys.stdout.write(SHELLS[args.shell]())
        return 0

    return cli.run_command("completion", body)


if __name__ == "__main__":
    sys.exit(main())
