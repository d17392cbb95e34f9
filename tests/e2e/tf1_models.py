"""TF Serving's own test SavedModels, rebuilt locally with ``tf.compat.v1``: the graph of its
``saved_model_half_plus_two.py`` (y = 0.5x + 2 behind ``ParseExample``, an asset, an init op
assigning the asset's name, predict / classify / regress signatures).

``half_plus_two`` is ``saved_model_half_plus_two_cpu`` (input ``x`` float ``[-1, 1]``).
``half_plus_three`` has the shape of the older ``saved_model_half_plus_three``: a
``legacy_init_op``, a serialized-example placeholder without a shape, and signatures whose
tensors carry no shape (TF1 exporters did not write one), which ``tf.saved_model.load`` cannot
load.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def build(export_dir: Path, *, legacy: bool = False) -> None:
    import tensorflow as tf
    from tensorflow.core.protobuf import saved_model_pb2

    v1: Any = tf.compat.v1
    constants = v1.saved_model.signature_constants
    info = v1.saved_model.utils.build_tensor_info
    signature = v1.saved_model.signature_def_utils.build_signature_def
    graph = tf.Graph()
    with graph.as_default(), v1.Session(graph=graph) as session:
        a = v1.Variable(0.5, name="a")
        b = v1.Variable(3.0 if legacy else 2.0, name="b")
        c = v1.Variable(3.0, name="c")
        serialized = v1.placeholder(tf.string, name="tf_example", shape=[None])
        features = {
            "x": v1.FixedLenFeature([1], dtype=tf.float32),
            "x2": v1.FixedLenFeature([1], dtype=tf.float32, default_value=[0.0]),
        }
        example = v1.parse_example(serialized, features)
        x = tf.identity(example["x"], name="x")
        y = tf.identity(a * x + b, name="y")
        y2 = tf.identity(a * x + c, name="y2")
        x2 = tf.identity(example["x2"], name="x2")
        y3 = tf.identity(a * x2 + c, name="y3")
        assets = export_dir.parent / f"{export_dir.name}-assets"
        assets.mkdir(parents=True, exist_ok=True)
        (assets / "foo.txt").write_text("asset-file-contents")
        v1.add_to_collection(v1.GraphKeys.ASSET_FILEPATHS, tf.constant(str(assets / "foo.txt")))
        filename = v1.Variable("foo.txt", name="filename_tensor", trainable=False, collections=[])
        init = tf.group(filename.assign("foo.txt"))
        predict = signature({"x": info(x)}, {"y": info(y)}, constants.PREDICT_METHOD_NAME)
        regress = {
            "x_to_y": ({constants.REGRESS_INPUTS: info(serialized)}, y),
            "x_to_y2": ({constants.REGRESS_INPUTS: info(serialized)}, y2),
            "x2_to_y3": ({constants.REGRESS_INPUTS: info(x2)}, y3),
        }
        if legacy:
            signatures = {
                "serving_default": predict,
                "tensorflow/serving/regress": signature(
                    {constants.REGRESS_INPUTS: info(serialized)},
                    {constants.REGRESS_OUTPUTS: info(y)},
                    constants.REGRESS_METHOD_NAME,
                ),
            }
        else:
            signatures = {
                "serving_default": predict,
                "classify_x_to_y": signature(
                    {constants.CLASSIFY_INPUTS: info(serialized)},
                    {constants.CLASSIFY_OUTPUT_SCORES: info(y)},
                    constants.CLASSIFY_METHOD_NAME,
                ),
                **{
                    f"regress_{key}": signature(
                        inputs,
                        {constants.REGRESS_OUTPUTS: info(out)},
                        constants.REGRESS_METHOD_NAME,
                    )
                    for key, (inputs, out) in regress.items()
                },
            }
        session.run(v1.global_variables_initializer())
        builder = v1.saved_model.builder.SavedModelBuilder(str(export_dir))
        ops = {"legacy_init_op": init} if legacy else {"main_op": init}
        builder.add_meta_graph_and_variables(
            session,
            [v1.saved_model.tag_constants.SERVING],
            signature_def_map=signatures,
            assets_collection=v1.get_collection(v1.GraphKeys.ASSET_FILEPATHS),
            **ops,
        )
        builder.save()
    if legacy:  # as TF 1.0 wrote it: no shapes on signatures, a shapeless placeholder
        path = export_dir / "saved_model.pb"
        saved = saved_model_pb2.SavedModel.FromString(path.read_bytes())
        for meta in saved.meta_graphs:
            # A graph of that age: an empty placeholder shape then meant "unknown".
            meta.graph_def.versions.producer = 20
            for definition in meta.signature_def.values():
                for tensor in (*definition.inputs.values(), *definition.outputs.values()):
                    tensor.ClearField("tensor_shape")
            for node in meta.graph_def.node:
                if node.name == "tf_example":
                    node.attr["shape"].shape.Clear()
                    (recorded,) = node.attr["_output_shapes"].list.shape
                    recorded.Clear()
                    recorded.unknown_rank = True
        path.write_bytes(saved.SerializeToString())
