"""What every benchmark shares: config layers and shipped configs, the command surface, the one runner, settings
reaching their run, records reproducible from their configs, rehearsals of the GPU configs."""
