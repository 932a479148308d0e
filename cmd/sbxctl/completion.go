package main

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
)

// completion prints a shell's completion script. The command names come
// from the command table; a command's flags are asked of sbxctl itself at
// completion time (sbxctl help NAME), so the script never goes stale.

func init() {
	register("completion", command{
		summary: "print the shell completion script (bash or zsh)",
		examples: `source <(sbxctl completion bash)                # bash, this shell
sbxctl completion bash > /etc/bash_completion.d/sbxctl   # bash, every shell
source <(sbxctl completion zsh)                 # zsh (in ~/.zshrc)`,
		run: runCompletion,
	})
}

func runCompletion(args []string, stdout, stderr io.Writer) int {
	if len(args) == 1 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help") {
		fmt.Fprintln(stderr, "usage: sbxctl completion bash|zsh")
		return 0
	}
	if len(args) != 1 || (args[0] != "bash" && args[0] != "zsh") {
		fmt.Fprintln(stderr, "usage: sbxctl completion bash|zsh")
		return 2
	}
	if args[0] == "zsh" {
		// zsh runs the bash function through its bash completion layer.
		fmt.Fprintln(stdout, "autoload -U +X compinit && compinit\nautoload -U +X bashcompinit && bashcompinit")
	}
	fmt.Fprint(stdout, bashCompletion())
	return 0
}

// bashCompletion is the bash script: first words, the second words of
// two-word commands, flags from sbxctl help, files otherwise.
func bashCompletion() string {
	first := map[string]bool{"help": true}
	second := map[string][]string{}
	for _, n := range commandNames() {
		w1, w2, two := strings.Cut(n, " ")
		first[w1] = true
		if two {
			second[w1] = append(second[w1], w2)
		}
	}
	var b strings.Builder
	b.WriteString(`# sbxctl completion (sbxctl completion bash|zsh)
_sbxctl() {
	local cur=${COMP_WORDS[COMP_CWORD]}
	COMPREPLY=()
	if [[ $COMP_CWORD -eq 1 ]]; then
		COMPREPLY=($(compgen -W "` + strings.Join(slices.Sorted(maps.Keys(first)), " ") + `" -- "$cur"))
		return
	fi
	local name=${COMP_WORDS[1]}
	case $name in
`)
	for _, w1 := range slices.Sorted(maps.Keys(second)) {
		fmt.Fprintf(&b, "\t%s)\n\t\tif [[ $COMP_CWORD -eq 2 ]]; then\n\t\t\tCOMPREPLY=($(compgen -W %q -- \"$cur\"))\n\t\t\treturn\n\t\tfi\n\t\tname=\"$name ${COMP_WORDS[2]}\";;\n",
			w1, strings.Join(second[w1], " "))
	}
	b.WriteString(`	help)
		COMPREPLY=($(compgen -W "` + strings.Join(slices.Sorted(maps.Keys(first)), " ") + `" -- "$cur"))
		return;;
	esac
	if [[ $cur == -* ]]; then
		local flags
		flags=$(sbxctl help $name 2>&1 | sed -n 's/^  \(-[a-z0-9-]*\).*/-\1/p')
		COMPREPLY=($(compgen -W "$flags" -- "$cur"))
		return
	fi
	COMPREPLY=($(compgen -f -- "$cur"))
}
complete -o default -F _sbxctl sbxctl
`)
	return b.String()
}
