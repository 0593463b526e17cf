"""The watched model: its layers and what their outputs mean (:mod:`.layers`), the names users know them by
(:mod:`.naming`), and parameters as declared, whatever shards them (:mod:`.shards`)."""
