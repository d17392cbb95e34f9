# Adapted from TorchServe's examples/image_classifier/mnist/mnist_handler.py and the
# VisionHandler it builds on (ts/torch_handler/vision_handler.py), Copyright (c) the TorchServe
# authors, Apache License 2.0. Changed: torchvision's ToTensor and Normalize are written out
# with numpy and torch (the same arithmetic), and VisionHandler's preprocess is inlined, so the
# handler needs neither torchvision nor captum; the request path is otherwise the example's.
import base64
import io

import numpy as np
import torch
from PIL import Image
from ts.torch_handler.base_handler import BaseHandler


def image_processing(image):
    """transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.1307,), (0.3081,))])"""
    pixels = torch.from_numpy(np.asarray(image, dtype=np.uint8).copy())
    tensor = pixels.unsqueeze(0).to(torch.float32).div(255)  # ToTensor: C x H x W in [0, 1]
    return (tensor - 0.1307) / 0.3081  # Normalize


class MNISTDigitClassifier(BaseHandler):
    """
    MNISTDigitClassifier handler class. This handler takes an image and returns the number in
    that image.
    """

    def preprocess(self, data):
        images = []
        for row in data:
            image = row.get("data") or row.get("body")
            if isinstance(image, str):
                image = base64.b64decode(image)
            if isinstance(image, (bytearray, bytes)):
                image = Image.open(io.BytesIO(image))
                image = image_processing(image)
            else:
                image = torch.FloatTensor(image)
            images.append(image)
        return torch.stack(images).to(self.device)

    def postprocess(self, data):
        return data.argmax(1).tolist()
