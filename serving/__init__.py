"""Ray Serve application: batched critic scoring over HTTP (`harnessrl.serving`). Imports core only."""
