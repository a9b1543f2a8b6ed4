"""Reads a TensorBoard event directory with the real tensorboard package (EventAccumulator and the
HParams plugin's protos) and prints its scalars, hparams, metric tags and session status as JSON."""
import sys, json
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2
acc = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0})
acc.Reload()
out = {"scalars": {}, "hparams": {}, "metric_tags": [], "status": None}
for tag in acc.Tags()["scalars"]:
    out["scalars"][tag] = [[e.step, e.value] for e in acc.Scalars(tag)]
for tag, content in acc.PluginTagToContent("hparams").items():
    data = plugin_data_pb2.HParamsPluginData.FromString(content)
    kind = data.WhichOneof("data")
    if kind == "session_start_info":
        for k, v in data.session_start_info.hparams.items():
            which = v.WhichOneof("kind")
            out["hparams"][k] = getattr(v, which)
    elif kind == "experiment":
        out["metric_tags"] = [m.name.tag for m in data.experiment.metric_infos]
        out["hparam_names"] = [h.name for h in data.experiment.hparam_infos]
    elif kind == "session_end_info":
        out["status"] = data.session_end_info.status
print(json.dumps(out))
