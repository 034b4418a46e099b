"""The data every stage of the analysis hands on: plain dataclasses, no computation beyond derived properties.

``rank`` (one rank's trace), ``across`` (the ranks compared), ``whatif`` (the replay), ``findings`` (the judge),
``run`` (the manifest), ``result`` (all of it: :class:`~hf_distprof.analysis.results.result.AnalysisResult`).
"""
