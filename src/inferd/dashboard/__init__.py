"""The web dashboard: its static page (``static/``) and the JSON the page needs that inferd's
other APIs lack (recent traffic, model files, Envoy's view of the cluster)."""
