"""Ray Data pipelines: ingest -> rewards -> transitions -> encode (imported as `harnessrl.pipelines`)."""
