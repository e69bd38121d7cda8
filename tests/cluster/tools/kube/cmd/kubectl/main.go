// Command kubectl is upstream's cmd/kubectl main, rebuilt at the same pinned release as the API
// server so the tests never depend on whatever (possibly far older) kubectl is on PATH.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	"k8s.io/kubectl/pkg/cmd"
	"k8s.io/kubectl/pkg/cmd/util"

	// Import to initialize client auth plugins.
	_ "k8s.io/client-go/plugin/pkg/client/auth"
)

func main() {
	// NB: verbosity must be set before the command is built (upstream does the same), because
	// building it already logs (plugins, .kuberc).
	logs.GlogSetter(cmd.GetLogVerbosity(os.Args)) //nolint:errcheck
	command := cmd.NewDefaultKubectlCommand()
	if err := cli.RunNoErrOutput(command); err != nil {
		util.CheckErr(err)
	}
}
