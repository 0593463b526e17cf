"""Extension points: pluggy hook specifications (:mod:`.hookspecs`) and the plugin manager (:mod:`.manager`)."""
